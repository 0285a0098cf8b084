# Sourced by bash through BASH_ENV in the verifier phase: put the offline shim first on PATH.
case ":$PATH:" in
  *":/opt/reterm-shim/bin:"*) ;;
  *) PATH="/opt/reterm-shim/bin:$PATH"; export PATH ;;
esac
RETERM_SHIM=1; export RETERM_SHIM
