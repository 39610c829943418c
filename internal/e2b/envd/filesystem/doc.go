// Package filesystem is the generated Go code of the sandbox plane's
// filesystem service (filesystem.proto); filesystemconnect serves it with
// connect-go.
package filesystem
