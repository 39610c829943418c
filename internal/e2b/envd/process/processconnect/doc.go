// Package processconnect is the generated connect-go client and handler of
// the sandbox plane's process service (process/process.proto).
package processconnect
