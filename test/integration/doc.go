// Package integration holds agentjail's end-to-end tests and benchmarks.
//
// They build the real binary once, start real daemons on temporary data
// dirs (loopback addresses only), and drive them as a user would: over the
// REST API with the bearer token, and through the CLI. Each daemon is torn
// down at the end (`agentjail teardown`), and the host is checked for
// leftovers: mounts, loop devices, cgroups, network namespaces, processes
// and temporary directories.
//
// The tests need root. Without it they skip, unless CI=true, where they fail.
package integration
