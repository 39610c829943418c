// Package envd holds the protobuf services of the E2B sandbox plane (the
// surface of E2B's in-sandbox daemon that the e2b SDKs call): the .proto
// files in process/ and filesystem/ and the Go code generated from them by
// scripts/gen-envd.sh (protoc-gen-go and protoc-gen-connect-go, pinned in
// go.mod). The generated code is committed; this package's test fails when
// it is stale.
package envd
