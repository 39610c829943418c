// Package filesystemconnect is the generated connect-go client and handler
// of the sandbox plane's filesystem service (filesystem/filesystem.proto).
package filesystemconnect
