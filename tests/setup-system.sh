#!/bin/bash
# Install the Debian packages the integration tests run for real (no mocks of the real parts). Idempotent.
# As root it installs what is missing; as another user it only reports what is missing.
set -euo pipefail
PKGS="slurm-wlm munge postgresql prometheus poppler-utils sqlite3 slurmdbd mariadb-server chromium chromium-driver"
missing=""
for p in $PKGS; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -z "$missing" ]; then
  echo "system-deps: all present ($PKGS)"
  exit 0
fi
if [ "$(id -u)" != 0 ]; then
  echo "system-deps: missing:$missing (run as root to install; integration tests will skip, or fail under CI=true)" >&2
  exit 0
fi
echo "system-deps: installing$missing"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
# policy-rc.d keeps package scripts from starting system services: the tests start their own servers.
printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d
trap 'rm -f /usr/sbin/policy-rc.d' EXIT
apt-get install -y -qq $missing >/tmp/ipledger-apt.log 2>&1 || {
  tail -30 /tmp/ipledger-apt.log >&2; exit 1; }
echo "system-deps: installed$missing"
