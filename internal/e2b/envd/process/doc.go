// Package process is the generated Go code of the sandbox plane's process
// service (process.proto); processconnect serves it with connect-go.
package process
