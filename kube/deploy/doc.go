// Package deploy holds how agentjail is installed in a cluster: the Helm
// chart (chart/agentjail) and the plain manifests rendered from it
// (manifests/agentjail.yaml). Its test lints the chart and checks that
// the manifests are what the chart renders.
package deploy
