#!/usr/bin/env bash
# Build meshnode from this checkout and install it as a service: the binary, the data dir and
# a hardened systemd unit.
#
#   sudo scripts/install.sh                 # install and reload systemd; the node runs as root
#   sudo scripts/install.sh --user meshnode # the node runs as the system user meshnode
#   scripts/install.sh --root /tmp/stage    # stage into a directory (no users, no systemctl)
set -euo pipefail

root=""
user="root"
version="$(git -C "$(dirname "$0")/.." describe --tags --always --dirty 2>/dev/null || echo dev)"
while [ $# -gt 0 ]; do
  case "$1" in
    --root) root="$2"; shift 2 ;;
    --user) user="$2"; shift 2 ;;
    --version) version="$2"; shift 2 ;;
    -h|--help) sed -n '2,8p' "$0"; exit 0 ;;
    *) echo "install.sh: unknown argument $1 (try --help)" >&2; exit 2 ;;
  esac
done
case "$user" in
  ''|-*|*[!a-z0-9_-]*) echo "install.sh: --user $user: a user name is lower case letters, digits, - and _" >&2; exit 2 ;;
esac

src="$(cd "$(dirname "$0")/.." && pwd)"
bin="$root/usr/local/bin/meshnode"
unit="$root/etc/systemd/system/meshnode.service"
dropin="$root/etc/systemd/system/meshnode.service.d/user.conf"

echo "building meshnode $version"
mkdir -p "$(dirname "$bin")" "$(dirname "$unit")"
(cd "$src" && CGO_ENABLED=0 go build -trimpath \
  -ldflags "-s -w -X github.com/meshnode/meshnode/formats.version=$version" \
  -o "$bin.new" ./cmd/meshnode)
mv "$bin.new" "$bin"
install -m 0644 "$src/scripts/meshnode.service" "$unit"
# The unit runs the node as root; a node of its own user is a drop-in, so the unit stays the
# one this checkout ships and a reinstall as root removes the drop-in.
if [ "$user" != root ]; then
  mkdir -p "$(dirname "$dropin")"
  printf '# Written by scripts/install.sh --user %s: the node runs as this user, its modules\n# too, kept apart by Landlock alone (docs/isolation.md).\n[Service]\nUser=%s\nGroup=%s\n' \
    "$user" "$user" "$user" >"$dropin"
  chmod 0644 "$dropin"
  echo "installed $bin, $unit and $dropin (User=$user)"
else
  rm -f "$dropin"
  echo "installed $bin and $unit"
fi

if [ -n "$root" ]; then
  echo "staged under $root: no data dir made, no user made, systemd not touched"
  exit 0
fi

# The data dir belongs to the user the node runs as, and so does everything in it: genesis
# or join run as root before this left files (operator.nk, keys: 0600) the service could
# not read. 0711: a module's own uid passes through to its directory; no other user lists it.
if [ "$user" != root ] && ! id -u "$user" >/dev/null 2>&1; then
  useradd --system --user-group --home-dir /var/lib/meshnode --no-create-home --shell /usr/sbin/nologin "$user"
  echo "made the system user $user"
fi
install -d -m 0711 -o "$user" -g "$(id -gn "$user")" /var/lib/meshnode
# Never as root: a node run as root gives each module's directory to the module's own uid.
if [ "$user" != root ]; then
  chown -R "$user:$(id -gn "$user")" /var/lib/meshnode
fi
if command -v systemctl >/dev/null 2>&1; then
  systemctl daemon-reload
fi

# Every command that writes the data dir runs as the node's user: files it makes are then its.
as=""
[ "$user" != root ] && as="-u $user "
cat <<MSG

Next (every command that touches /var/lib/meshnode runs as $user, the node's user):
  1. create the mesh with this machine as its first node (genesis mints and exits):
       sudo ${as}meshnode genesis --data-dir /var/lib/meshnode --name \$(hostname -s)
     or join a mesh (--no-run prepares the data dir and exits; the token file stays root's):
       sudo cat /root/mesh.token | sudo ${as}meshnode join --no-run --token-file /dev/stdin \\
         --data-dir /var/lib/meshnode --name \$(hostname -s) --cluster-addr … --gossip-addr …
  2. run it as a service:
       sudo systemctl enable --now meshnode
       sudo ${as}meshnode status --data-dir /var/lib/meshnode
MSG
