# Sourced by bash through BASH_ENV in the verifier phase: put the offline shim first on PATH.
case ":$PATH:" in
  *":/opt/reterm-shim/bin:"*) ;;
  *) PATH="/opt/reterm-shim/bin:$PATH"; export PATH ;;
esac
RETERM_SHIM=1; export RETERM_SHIM
# `--ctrf` for pytest however it is started (`pytest`, `python -m pytest`): the shim's CTRF plugin, which stands
# aside when the real pytest-json-ctrf is installed (with a network the pip shim may install it)
case ",${PYTEST_PLUGINS:-}," in
  *",reterm_ctrf,"*) ;;
  *) PYTEST_PLUGINS="${PYTEST_PLUGINS:+$PYTEST_PLUGINS,}reterm_ctrf"; export PYTEST_PLUGINS ;;
esac
case ":${PYTHONPATH:-}:" in
  *":/opt/reterm-shim/python:"*) ;;
  *) PYTHONPATH="/opt/reterm-shim/python${PYTHONPATH:+:$PYTHONPATH}"; export PYTHONPATH ;;
esac
