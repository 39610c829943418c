// Package e2e tests agentjail in a real Kubernetes control plane: etcd,
// kube-apiserver and kube-scheduler (package kubetest) and two agentjail
// nodes on this host, each a daemon with its own data dir. The tests run
// as root, one control plane for all of them (TestCluster's subtests).
package e2e
