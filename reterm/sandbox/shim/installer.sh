#!/bin/sh
# Stand-in for uv's installer script (served by the shim's curl): no download, link the shim's uv.
set -e
for d in "$HOME/.local/bin" "$HOME/.cargo/bin"; do
  mkdir -p "$d"
  ln -sf /opt/reterm-shim/bin/uv "$d/uv"
  ln -sf /opt/reterm-shim/bin/uvx "$d/uvx"
done
cat > "$HOME/.local/bin/env" <<'ENV'
case ":$PATH:" in *":$HOME/.local/bin:"*) ;; *) export PATH="$HOME/.local/bin:$PATH" ;; esac
ENV
cat > "$HOME/.cargo/env" <<'ENV'
case ":$PATH:" in *":$HOME/.cargo/bin:"*) ;; *) export PATH="$HOME/.cargo/bin:$PATH" ;; esac
ENV
echo "uv (reterm offline shim) installed to $HOME/.local/bin" >&2
