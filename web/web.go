// Package web holds the browser side of agentjail's console: the pages,
// scripts and styles under static/, embedded in the binary. The third-party
// libraries in static/vendor/ (xterm.js, its fit addon, asciinema-player)
// are copied from the npm packages pinned in package-lock.json by
// scripts/web-vendor.sh; nothing is loaded from another site at run time.
package web

import (
	"embed"
	"io/fs"
)

//go:embed static
var static embed.FS

// Static returns the console's files, rooted at static/.
func Static() fs.FS {
	sub, err := fs.Sub(static, "static")
	if err != nil {
		panic(err) // static/ is embedded above
	}
	return sub
}
