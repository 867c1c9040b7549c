#!/usr/bin/env bash
# Build meshnode from this checkout and install it as a service: the binary, the data dir and
# a hardened systemd unit.
#
#   sudo scripts/install.sh                 # install and reload systemd
#   scripts/install.sh --root /tmp/stage    # stage into a directory (no users, no systemctl)
set -euo pipefail

root=""
version="$(git -C "$(dirname "$0")/.." describe --tags --always --dirty 2>/dev/null || echo dev)"
while [ $# -gt 0 ]; do
  case "$1" in
    --root) root="$2"; shift 2 ;;
    --version) version="$2"; shift 2 ;;
    -h|--help) sed -n '2,7p' "$0"; exit 0 ;;
    *) echo "install.sh: unknown argument $1 (try --help)" >&2; exit 2 ;;
  esac
done

src="$(cd "$(dirname "$0")/.." && pwd)"
bin="$root/usr/local/bin/meshnode"
unit="$root/etc/systemd/system/meshnode.service"

echo "building meshnode $version"
mkdir -p "$(dirname "$bin")" "$(dirname "$unit")"
(cd "$src" && CGO_ENABLED=0 go build -trimpath \
  -ldflags "-s -w -X github.com/meshnode/meshnode/node.version=$version" \
  -o "$bin.new" ./cmd/meshnode)
mv "$bin.new" "$bin"
install -m 0644 "$src/scripts/meshnode.service" "$unit"
echo "installed $bin and $unit"

if [ -n "$root" ]; then
  echo "staged under $root: no data dir made, systemd not touched"
  exit 0
fi

# The node runs as root with only the capabilities its sandbox needs, and each module as a
# uid of its own (docs/isolation.md); its data dir is passed through by them, listed by none.
install -d -m 0711 -o root -g root /var/lib/meshnode
if command -v systemctl >/dev/null 2>&1; then
  systemctl daemon-reload
fi

cat <<MSG

Next:
  1. create the mesh with this machine as its first node (genesis mints and exits; a
     machine joining a mesh runs join with --token-file instead):
       sudo meshnode genesis --data-dir /var/lib/meshnode --name \$(hostname -s)
  2. run it as a service:
       sudo systemctl enable --now meshnode
       meshnode status --data-dir /var/lib/meshnode
MSG
