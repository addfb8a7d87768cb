# Sourced by the top-level scripts: make sure the project's tools venv exists
# and holds this checkout's package, then export KIMIDFLASH_PY.
# Re-installs only when pyproject.toml changes.
_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
_venv="${KIMIDFLASH_VENV:-$_root/.venv}"
_stamp="$_venv/.kimidflash-$(sha256sum "$_root/pyproject.toml" | cut -c1-16)"
if [ ! -e "$_stamp" ]; then
  # One caller builds at a time: two scripts started together (serve and the tests) would
  # otherwise both run pip into the same venv, and pip does not survive that.
  mkdir -p "$_venv"
  (
    flock 9
    if [ ! -e "$_stamp" ]; then
      echo "kimidflash: preparing $_venv (once)" >&2
      python3 -m venv "$_venv"
      "$_venv/bin/pip" install -q --disable-pip-version-check -e "$_root[test]" >&2
      rm -f "$_venv"/.kimidflash-* && touch "$_stamp"
    fi
  ) 9>"$_venv/.lock"
fi
export KIMIDFLASH_PY="$_venv/bin/python"
