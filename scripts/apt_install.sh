# Sourced by scripts/setup.sh and scripts/browser_test.sh: install Debian packages with apt-get.
#
#   apt_install CALLER PACKAGE...
#
# Runs `apt-get update` and `apt-get install -y PACKAGE...` as root, or through sudo, and reports progress
# with the caller's `say`. Exits with a message naming CALLER when apt-get is missing (another system:
# install the packages by hand) or when neither root nor sudo is available.
apt_install() {
    local caller="$1"
    shift
    if ! command -v apt-get >/dev/null 2>&1; then
        echo "$caller: please install $* with your system's package manager, then run again" >&2
        exit 1
    fi
    local sudo=()
    if [[ $EUID -ne 0 ]]; then
        command -v sudo >/dev/null 2>&1 || {
            echo "$caller: installing $* needs root; run as root or install sudo" >&2
            exit 1
        }
        sudo=(sudo)
    fi
    say "apt-get update && apt-get install -y $*"
    "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -q
    "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$@"
}
