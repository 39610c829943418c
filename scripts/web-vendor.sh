#!/usr/bin/env bash
# Copies the console's third-party browser libraries from the npm packages
# pinned in web/package-lock.json into web/static/vendor/ (committed, so a
# build needs no npm). Run it after changing web/package.json; the test
# TestVendoredAssets checks the committed copies against the packages.
set -euo pipefail
cd "$(dirname "$0")/../web"
npm ci --no-audit --no-fund --ignore-scripts
out=static/vendor
rm -rf "$out"
mkdir -p "$out"
cp node_modules/@xterm/xterm/lib/xterm.mjs "$out/xterm.mjs"
cp node_modules/@xterm/xterm/css/xterm.css "$out/xterm.css"
cp node_modules/@xterm/addon-fit/lib/addon-fit.mjs "$out/addon-fit.mjs"
cp node_modules/asciinema-player/dist/bundle/asciinema-player.min.js "$out/asciinema-player.min.js"
cp node_modules/asciinema-player/dist/bundle/asciinema-player.css "$out/asciinema-player.css"
for p in @xterm/xterm @xterm/addon-fit asciinema-player; do
	name=${p//\//-}
	name=${name#@}
	cp "node_modules/$p/LICENSE" "$out/LICENSE.$name" 2>/dev/null || cp "node_modules/$p/LICENSE.md" "$out/LICENSE.$name"
done
# Drop the source-map references: the maps are not shipped.
sed -i '/^\/\/# sourceMappingURL=/d' "$out"/*.mjs
(cd "$out" && sha256sum -- * > SHA256SUMS)
echo "web-vendor: $(ls "$out" | wc -l) files in web/$out"
