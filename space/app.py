"""ReTerm Space: watch a terminal agent fail, fork its sandbox, and recover, step by step.

    python space/app.py [--host 127.0.0.1] [--port 7860] [--tasks DIR]... [--source SPEC]...

- **Replay** (always available, no GPU): ReTerm-10K records (a dataset folder, a parquet/jsonl file or a
  Hub dataset id; an unreachable Hub fails within seconds and clears the view), Harbor job folders (also
  the ``-o`` folder of ``harbor run``), ReTerm-GRPO rollouts, or folders of recovery-attempt trajectories
  (eval's recovery from recorded states, this app's saved live runs) shown as steps: model reasoning,
  the command and its output in a terminal pane, exit status, the failure step marked with its error
  category, then the recovery; fan-outs show the G attempts side by side with their rewards.
- **Live** (hosts that can run the local sandbox): pick a task and a model (embedded SmolLM2, a local
  checkpoint or Hub model, an OpenAI-compatible endpoint, or the scripted oracle); the agent runs in
  the sandbox and each step streams in (turn k of N, seconds per turn); at the first failure the sandbox
  is forked and G recovery attempts run side by side, each judged by the task's verifier. Stop, or the
  browser session ending (tab closed), tears every sandbox down; runs are saved after every step.

Settings (flags win over environment variables): ``--host``/``GRADIO_SERVER_NAME`` (default 127.0.0.1),
``--port``/``GRADIO_SERVER_PORT`` (7860), ``--tasks``/``RETERM_SPACE_TASKS`` (task roots, ``:``-separated),
``--source``/``RETERM_SPACE_SOURCES`` (replay sources offered, ``;``-separated; the first is opened),
``--runs-dir``/``RETERM_SPACE_RUNS`` (saved live runs), ``--max-forks``/``RETERM_SPACE_MAX_FORKS`` (8),
``--public`` (automatic on a Hugging Face Space: no local paths typed by visitors), ``RETERM_SPACE_LIVE=0``
(replay only), ``RETERM_SPACE_MODELS`` (``;``-separated Hub model ids added to the model list).
On a ZeroGPU Space local models generate inside ``@spaces.GPU`` (see ``live_run``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

# Set before torch loads: OpenMP threads that spin while waiting make CPU generation several times slower
# beside the sandboxes; LiteLLM (imported with Harbor) reads its bundled cost map instead of retrying a
# download offline. A value the user chose wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
try:  # the kit: installed (pip install -e .), or this file sits in a checkout of it
    import reterm  # noqa: F401
except ImportError:  # pragma: no cover - depends on the install
    sys.path.insert(0, str(HERE.parent))

import gradio as gr  # noqa: E402

from live_run import (  # noqa: E402
    MAX_FORKS,
    MAX_TURNS,
    MODEL_CHOICES,
    LiveRun,
    LiveState,
    PolicyCache,
    list_tasks,
    read_instruction,
    sandbox_availability,
    validate_request,
)
from replay_sources import _HUB_ID, Source, SourceError, open_source  # noqa: E402
from trajectory_view import CSS as VIEW_CSS  # noqa: E402
from trajectory_view import (  # noqa: E402
    EpisodeView,
    FanOutView,
    category_text,
    esc,
    render_attempts,
    render_episode,
    render_fanout,
    render_notice,
)

TITLE = "ReTerm · recovery, step by step"
INTRO = (
    "Terminal agents fail all the time: a missing tool, a wrong flag, a file that is not where they think. "
    "**ReTerm** trains them to recover from their *own* mistakes. Each example starts from a real failure "
    "state: the agent types a command, the terminal errors, the sandbox is **forked**, several recovery "
    "attempts continue from exactly that state, and the task's **verifier** says which ones worked. "
    "**Replay** browses recorded recoveries (ReTerm-10K records, Harbor jobs, GRPO groups); **Live** runs "
    "the agent in a local sandbox and forks recovery attempts as soon as a step fails."
)
APP_CSS = """
.rt-hero h1 { font-size: 28px; margin-bottom: 2px; }
.rt-hero p { font-size: 15px; max-width: 980px; }
.rt-status-md { font-size: 14px; }
.rt-open-btn { align-self: flex-end !important; max-height: 52px; margin-bottom: 12px; }
"""


# =================================================================================== config
@dataclass
class AppConfig:
    """What the app offers.

    Attributes:
        task_roots: folders holding Harbor task folders (live mode's task list).
        sources: replay sources listed in the source picker (the first is opened at page load).
        runs_dir: where live runs are saved (offered as a replay source once it holds runs).
        allowed_roots: local paths replay may open (``None``: any; a public Space confines them).
        allow_local_paths: visitors may type local task folders / checkpoints (off when public).
        max_forks: most recovery attempts per failure state.
        live_concurrency: live runs at once (others wait in Gradio's queue).
        live_available / live_message: whether live mode is on, and what to tell visitors.
        models: extra ``hf:<Hub id>`` models offered in the model list (``RETERM_SPACE_MODELS``).
    """

    task_roots: list[Path] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)
    runs_dir: Path | None = None
    allowed_roots: list[Path] | None = None
    allow_local_paths: bool = True
    max_forks: int = MAX_FORKS
    live_concurrency: int = 1
    live_available: bool = True
    live_message: str = ""
    models: list[str] = field(default_factory=list)


def _cache_dir() -> Path:
    return Path(os.environ.get("RETERM_CACHE") or Path.home() / ".cache" / "reterm").expanduser()


EXAMPLES = ("model-recoveries", "recoveries", "records")
"""The bundled examples under ``examples/`` in the order offered (:mod:`make_examples` writes them): a trained
model's own recorded recovery attempts first, then the scripted oracle's fan-outs, then a few records."""


def shown_name(path: Path) -> str:
    """How a local source is named in the page: relative to the kit's checkout (``space/examples/records``,
    ``runs/...``), or to the home folder (``~/...``), never a machine's absolute path where either applies."""
    path = Path(path).expanduser()
    for base, prefix in ((HERE.parent, ""), (Path.home(), "~/")):
        try:
            return prefix + str(path.resolve().relative_to(base.resolve()))
        except ValueError:
            continue
    return str(path)


def resolve_source(spec: str) -> str:
    """A source spec as :func:`replay_sources.open_source` takes it: ``~`` expanded; a relative path that is not
    found from the working folder is looked up in the kit's checkout, then next to app.py (the names
    :func:`shown_name` gives). Anything else (a Hub id, a missing path) is returned as given."""
    spec = (spec or "").strip()
    path = Path(spec).expanduser()
    if not spec or path.is_absolute() or path.exists():
        return str(path) if path.exists() else spec
    for base in (HERE.parent, HERE):
        if (base / path).exists():
            return str(base / path)
    return spec


def default_config(
    *,
    tasks: list[str] | None = None,
    sources: list[str] | None = None,
    runs_dir: str | None = None,
    max_forks: int | None = None,
    public: bool | None = None,
) -> AppConfig:
    """The configuration from arguments, then environment variables, then defaults (module docstring).

    Default task roots: ``tasks/`` of the kit's checkout (or next to app.py). Default replay sources: the
    ReTerm-GRPO groups and the dataset of the checkout's embedded-default run (``runs/smollm2-135m/``) when it
    exists, the bundled ``examples/`` next to app.py (in :data:`EXAMPLES` order: a fresh clone opens on a trained
    model's recorded failure and its forked recovery attempts), saved live runs, the checkout's test fixtures, and ``twothsnd/ReTerm-10K``; local
    ones are named as :func:`shown_name` gives (relative to the checkout), never by a machine's absolute path.
    """
    env = os.environ
    if tasks is None and env.get("RETERM_SPACE_TASKS"):
        tasks = [t for t in env["RETERM_SPACE_TASKS"].split(os.pathsep) if t]
    if tasks:
        roots = [Path(t).expanduser() for t in tasks]
    else:
        roots = [p for p in (HERE.parent / "tasks", HERE / "tasks") if p.is_dir()]
    runs = Path(runs_dir or env.get("RETERM_SPACE_RUNS") or _cache_dir() / "space-runs").expanduser()
    if sources is None and env.get("RETERM_SPACE_SOURCES"):
        sources = [s.strip() for s in env["RETERM_SPACE_SOURCES"].split(";") if s.strip()]
    if sources is None:
        sources = []
        # a run of `bash train/run_all.sh` in this checkout: its ReTerm-GRPO groups first (the trained model's
        # own attempts, recovered or not), then its dataset
        for rel in ("runs/smollm2-135m/grpo-reterm/rollouts", "runs/smollm2-135m/data"):
            if (HERE.parent / rel).exists():
                sources.append(str(HERE.parent / rel))
        examples = HERE / "examples"
        if examples.is_dir():  # a trained model's own failure and recovery attempts first (a fresh clone opens on it)
            folders = [p for p in sorted(examples.iterdir()) if p.is_dir()]
            folders.sort(key=lambda p: EXAMPLES.index(p.name) if p.name in EXAMPLES else len(EXAMPLES))
            sources += [str(p) for p in folders]
        if runs.is_dir() and any(runs.iterdir()):
            sources.append(str(runs))
        for rel in ("tests/fixtures/reterm10k_mini", "tests/fixtures/jobs/demo"):
            if (HERE.parent / rel).is_dir():
                sources.append(str(HERE.parent / rel))
        sources = [shown_name(Path(s)) for s in sources]
        sources.append("twothsnd/ReTerm-10K")
    if public is None:
        public = bool(env.get("SPACE_ID")) and not env.get("RETERM_SPACE_ALLOW_PATHS")
    forks = int(max_forks if max_forks is not None else env.get("RETERM_SPACE_MAX_FORKS") or MAX_FORKS)
    allowed = None
    if public:
        allowed = [HERE, runs] + [Path(resolve_source(s)) for s in sources if Path(resolve_source(s)).exists()] + roots
    models = [m if m.startswith("hf:") else f"hf:{m}" for m in env.get("RETERM_SPACE_MODELS", "").split(";") if m.strip()]
    ok, message = sandbox_availability()
    return AppConfig(task_roots=roots, sources=sources, runs_dir=runs, allowed_roots=allowed,
                     allow_local_paths=not public, max_forks=max(0, forks), live_available=ok, live_message=message,
                     models=models)  # fmt: skip


# =================================================================================== replay
class _Sources:
    """Opened replay sources (a few, least recently used dropped)."""

    def __init__(self, config: AppConfig, size: int = 6) -> None:
        self.config, self.size = config, size
        self._open: OrderedDict[str, Source] = OrderedDict()
        self._lock = threading.Lock()  # handlers run in Gradio's worker threads

    def get(self, spec: str, reload: bool = False) -> Source:
        spec = (spec or "").strip()
        with self._lock:
            if spec in self._open and not reload:
                self._open.move_to_end(spec)
                return self._open[spec]
        src = open_source(resolve_source(spec), allowed_roots=self.config.allowed_roots)
        with self._lock:
            self._open[spec] = src
            while len(self._open) > self.size:
                self._open.popitem(last=False)
        return src


def _view_summary(view: EpisodeView | FanOutView) -> dict:
    """A JSON digest of a replay view (the API output next to its HTML)."""
    def steps(traj, start=0):
        return [{"index": s.index, "command": s.command, "tool": s.action.tool if s.action else None,
                 "exit_status": s.exit_status, "parse_error": s.parse_error} for s in traj.steps[start:]]  # fmt: skip

    if isinstance(view, FanOutView):
        p = view.prefix
        return {"kind": "fanout", "task_id": p.trajectory.task_id, "failure_step": p.failure_step,
                "failure_category": p.failure_category, "prefix": steps(p.trajectory),
                "attempts": [{"reward": a.reward, "outcome": a.outcome.value, "stop_reason": a.stop_reason,
                              "steps": steps(a, a.prefix_len)} for a in view.attempts]}  # fmt: skip
    t = view.trajectory
    return {"kind": "episode", "task_id": t.task_id, "failure_step": view.failure_step,
            "failure_category": view.failure_category, "recovery_from": view.recovery_from,
            "reward": t.reward, "outcome": t.outcome.value, "steps": steps(t)}  # fmt: skip


# ===================================================================================== live
def _status_md(st: LiveState) -> str:
    elapsed = time.monotonic() - st.t0
    icon = "⏹" if st.cancelled else "⚠️" if st.error else "✅" if st.done else "⏳"
    lines = [f"{icon} **{st.phase}** · {elapsed:.1f} s · task `{st.request.task_id}` · policy `{st.request.policy_spec}`"]
    if st.error:
        lines.append(f"\n**Error:** {st.error}")
    if st.timeline:
        lines.append("\n" + "\n".join(f"- `{t:6.2f} s` {text}" for t, text in st.timeline[-8:]))
    return "\n".join(lines)


def render_live(st: LiveState) -> tuple[str, str, str, dict]:
    """(status markdown, episode HTML, attempts HTML, JSON summary) of a live run's state."""
    if st.main is None:
        main_html = render_notice("Starting the sandbox …")
    else:
        forked = bool(st.attempts) or (st.failure_category is not None and st.request.forks and not st.done)
        view = EpisodeView(st.main, title=f"{st.request.task_id} · the agent's episode",
                           failure_step=st.failure_step, failure_category=st.failure_category,
                           failure_evidence=st.failure_evidence,
                           meta=[("policy", st.request.policy_spec), ("run", st.run_id)],
                           running=not st.done and (st.failure_category is None or not st.request.forks),
                           show_verifier=not forked or st.forked_at_end,
                           prefix_note=(f"🔀 sandbox forked at this state into {st.request.forks} recovery attempts"
                                        + (f" in {st.fork_s:.2f} s" if st.fork_s else "")) if forked else "")  # fmt: skip
        if not st.request.forks and st.failure_step is not None and st.failure_step + 1 < len(st.main.steps):
            view.recovery_from = st.failure_step + 1  # no fan-out: the agent's own continuation
        main_html = render_episode(view)
    attempts_html = ""
    if st.attempts:
        attempts_html = render_attempts(st.attempts, running=not st.done)
    elif st.failure_category is not None and st.request.forks and not st.done:
        attempts_html = render_notice(f"Forking the sandbox into {st.request.forks} recovery attempts …")
    return _status_md(st), main_html, attempts_html, st.summary()


# ====================================================================================== app
def build_demo(config: AppConfig) -> gr.Blocks:
    """The Gradio Blocks app (launch with :func:`launch`, which adds the theme and CSS)."""
    sources = _Sources(config)
    policies = PolicyCache()
    tasks = list_tasks(config.task_roots)
    task_choices = [(f"{name} ({split})" if split else name, name) for name, (_, split) in tasks.items()]
    default_task = next((n for n in ("replace-missing-jq", "hello-file") if n in tasks), next(iter(tasks), None))

    # ------------------------------------------------------------------- replay handlers
    def clear_view(spec: str):
        """Before a source opens: nothing of the previous source stays on screen under the new name."""
        return (gr.update(choices=[], value=None), f"⏳ opening **{esc((spec or '').strip())}** …",
                render_notice("Opening the source …"), {})  # fmt: skip

    def open_failed(spec: str):
        return f"⚠️ **{esc((spec or '').strip())}** could not be opened (the message says why)."

    def open_src(spec: str, category: str):
        try:
            src = sources.get(spec, reload=True)
        except SourceError as exc:
            raise gr.Error(str(exc)) from None
        cats = src.categories()
        category = category if category in cats else "all"
        items = src.filtered(category)
        choices = [(i.label, i.key) for i in items]
        info = f"**{esc(src.description)}**"
        if len(items) < len(src.items):
            info += f" · showing {len(items)} of {len(src.items)}"
        return (gr.update(choices=choices, value=choices[0][1] if choices else None),
                gr.update(choices=[("all categories", "all")] + [(category_text(c), c) for c in cats], value=category),
                info)  # fmt: skip

    def filter_items(spec: str, category: str):
        try:
            src = sources.get(spec)
        except SourceError as exc:
            raise gr.Error(str(exc)) from None
        choices = [(i.label, i.key) for i in src.filtered(category)]
        return gr.update(choices=choices, value=choices[0][1] if choices else None)

    def show_item(spec: str, key: str, expand: bool):
        if not key:
            return render_notice("Pick an item to replay."), {}
        try:
            view = sources.get(spec).view(key)
        except SourceError as exc:
            raise gr.Error(str(exc)) from None
        if isinstance(view, FanOutView):
            html = render_fanout(view, expand_all=expand)
        else:
            html = render_episode(view, expand_all=expand)
        return html, _view_summary(view)

    def step_item(spec: str, key: str, category: str, delta: int):
        try:
            items = sources.get(spec).filtered(category)
        except SourceError as exc:
            raise gr.Error(str(exc)) from None
        keys = [i.key for i in items]
        if not keys:
            return gr.update()
        i = keys.index(key) if key in keys else -1
        return gr.update(value=keys[(i + delta) % len(keys)])

    # --------------------------------------------------------------------- live handler
    session_runs: dict[str, set[LiveRun]] = {}  # live runs by browser session, stopped when it ends

    def end_session(request: gr.Request) -> None:
        """The browser tab was closed or reloaded: stop that session's live runs (sandboxes torn down)."""
        for run in list(session_runs.pop(getattr(request, "session_hash", None) or "", set())):
            run.cancel("the browser session ended")

    async def live(task, task_folder, instruction, model, checkpoint, base_url, endpoint_model, forks, max_turns,
                   recovery_turns, temperature, max_new_tokens, first_command, request: gr.Request = None):  # fmt: skip
        if not config.live_available:
            raise gr.Error(config.live_message or "Live mode is not available on this host.")
        try:
            req = await asyncio.to_thread(
                validate_request, task="" if (task_folder or "").strip() else task or "",
                task_folder=task_folder or "", instruction=instruction or "", model=model, checkpoint=checkpoint or "",
                base_url=base_url or "", endpoint_model=endpoint_model or "", forks=forks, max_turns=max_turns,
                recovery_turns=recovery_turns, temperature=temperature, max_new_tokens=max_new_tokens,
                first_command=first_command or "", task_roots=config.task_roots,
                allow_local_paths=config.allow_local_paths, max_forks=config.max_forks, extra_models=config.models,
            )  # fmt: skip
        except ValueError as exc:
            raise gr.Error(str(exc)) from None
        if req.model == "oracle" and req.forks and not req.first_command:
            gr.Warning("The oracle replays the task's reference solution and rarely fails: give it a first command "
                       "(a mistake) to see the sandbox forked into recovery attempts.")  # fmt: skip
        yield (f"⏳ **loading the policy** `{req.policy_spec}` …", render_notice("Loading the model …"), "", {})
        try:
            policy = await asyncio.to_thread(policies.get, req)
        except ValueError as exc:
            raise gr.Error(str(exc)) from None
        events: asyncio.Queue[None] = asyncio.Queue()
        run = LiveRun(req, policy, runs_dir=config.runs_dir, notify=lambda: events.put_nowait(None))
        task_ = asyncio.create_task(run.run())
        run.task = task_
        session = getattr(request, "session_hash", None) or ""
        session_runs.setdefault(session, set()).add(run)
        try:
            while not task_.done():
                try:
                    await asyncio.wait_for(events.get(), timeout=2.0)
                except asyncio.TimeoutError:
                    pass
                while not events.empty():
                    events.get_nowait()
                yield render_live(run.state)
            yield render_live(run.state)
        finally:  # Stop / cancel / disconnect: stop the run; its teardown stops every sandbox
            session_runs.get(session, set()).discard(run)
            if not task_.done():
                run.cancel("stopped")
            await asyncio.gather(task_, return_exceptions=True)

    # --------------------------------------------------------------------------- layout
    with gr.Blocks(title=TITLE) as demo:
        with gr.Column(elem_classes="rt-hero"):
            gr.Markdown(f"# {TITLE}\n\n{INTRO}")
        with gr.Tabs():
            with gr.Tab("Replay", id="replay"):
                with gr.Row(equal_height=True):
                    src_box = gr.Dropdown(choices=config.sources, value=config.sources[0] if config.sources else None,
                                          allow_custom_value=True, label="Source",
                                          info="ReTerm-10K dataset folder or Hub id, Harbor job folder, or a folder of "
                                               "recovery attempts", scale=5)  # fmt: skip
                    cat_box = gr.Dropdown(choices=[("all categories", "all")], value="all", label="Error category",
                                          allow_custom_value=True, scale=2)
                    open_btn = gr.Button("Open", variant="primary", size="md", scale=1, min_width=90,
                                         elem_classes="rt-open-btn")  # fmt: skip
                src_info = gr.Markdown()
                with gr.Row(equal_height=False):
                    item_box = gr.Dropdown(choices=[], label="Trajectory", allow_custom_value=True, scale=6)
                    prev_btn = gr.Button("◀ prev", size="sm", scale=0, min_width=80)
                    next_btn = gr.Button("next ▶", size="sm", scale=0, min_width=80)
                    expand_box = gr.Checkbox(label="expand all steps", value=False, scale=1)
                view_html = gr.HTML(elem_id="replay-view")
                with gr.Accordion("Data (JSON)", open=False):
                    view_json = gr.JSON()
            with gr.Tab("Live", id="live"):
                if not config.live_available:
                    gr.HTML(render_notice(config.live_message, "warn"))
                elif config.live_message:
                    gr.HTML(render_notice(config.live_message, "info"))
                with gr.Row():
                    task_box = gr.Dropdown(choices=task_choices, value=default_task, label="Task", allow_custom_value=True,
                                           info="from the task suite (train/test split shown)", scale=3)  # fmt: skip
                    model_box = gr.Dropdown(choices=[(v, k) for k, v in _model_choices(config).items()], value="smollm2",
                                            label="Model", scale=3)  # fmt: skip
                    forks_box = gr.Slider(0, config.max_forks, value=min(3, config.max_forks), step=1,
                                          label="Recovery attempts (G)", info="sandboxes forked at the failure", scale=2)  # fmt: skip
                first_box = gr.Textbox(label="Start with a mistake (optional)",
                                       placeholder="a command typed before the model's first turn, e.g. `jq . data.json` "
                                                   "or `pip install pandas` (there is no network)")  # fmt: skip
                with gr.Accordion("More settings", open=False):
                    with gr.Row():
                        turns_box = gr.Slider(1, MAX_TURNS, value=8, step=1, label="Max turns (episode)")
                        rturns_box = gr.Slider(1, MAX_TURNS, value=8, step=1, label="Max turns (each recovery attempt)")
                        temp_box = gr.Slider(0, 1.5, value=0.7, step=0.05, label="Temperature")
                        tokens_box = gr.Slider(16, 1024, value=256, step=16, label="Max new tokens per turn")
                    with gr.Row():
                        ckpt_box = gr.Textbox(label="Checkpoint (model: local checkpoint)",
                                              placeholder="./outputs/sft or ORG/NAME")
                        url_box = gr.Textbox(label="Endpoint base URL (model: endpoint)",
                                             placeholder="http://127.0.0.1:8000/v1")
                        served_box = gr.Textbox(label="Served model name (model: endpoint)", placeholder="smollm2")
                    with gr.Row(visible=config.allow_local_paths):
                        folder_box = gr.Textbox(label="Local task folder (instead of a suite task)",
                                                placeholder="path/to/harbor-task (task.toml, environment/, tests/)")  # fmt: skip
                    instr_box = gr.Textbox(label="Instruction (leave empty to use the task's own)", lines=3)
                with gr.Row():
                    run_btn = gr.Button("▶ Run", variant="primary", interactive=config.live_available)
                    stop_btn = gr.Button("■ Stop", variant="stop")
                live_status = gr.Markdown(elem_classes="rt-status-md")
                live_main = gr.HTML(elem_id="live-main")
                live_attempts = gr.HTML(elem_id="live-attempts")
                with gr.Accordion("Run data (JSON)", open=False):
                    live_json = gr.JSON()
                if task_choices:
                    gr.Examples(
                        examples=[[n, "oracle", c, 3] for n, c in (("replace-missing-jq", "jq -r '.[].name' users.json"),
                                                                   ("hello-file", "cat /app/hello.txt")) if n in tasks],
                        inputs=[task_box, model_box, first_box, forks_box], label="Try",
                    )  # fmt: skip

        # ------------------------------------------------------------------------ events
        open_evt = dict(fn=open_src, inputs=[src_box, cat_box], outputs=[item_box, cat_box, src_info])
        clear_evt = dict(fn=clear_view, inputs=[src_box], outputs=[item_box, src_info, view_html, view_json],
                         queue=False, api_name=False)  # fmt: skip
        open_btn.click(**clear_evt).then(**open_evt, api_name="open_source").failure(
            open_failed, src_box, src_info, api_name=False)  # fmt: skip
        demo.load(**open_evt, api_name=False).failure(open_failed, src_box, src_info, api_name=False)
        cat_box.input(filter_items, [src_box, cat_box], item_box, api_name=False)
        item_box.change(show_item, [src_box, item_box, expand_box], [view_html, view_json], api_name="show_item")
        expand_box.change(show_item, [src_box, item_box, expand_box], [view_html, view_json], api_name=False)
        prev_btn.click(lambda s, k, c: step_item(s, k, c, -1), [src_box, item_box, cat_box], item_box, api_name=False)
        next_btn.click(lambda s, k, c: step_item(s, k, c, +1), [src_box, item_box, cat_box], item_box, api_name=False)
        folder_box.change(lambda f: read_instruction(Path(f)) if f and (Path(f) / "task.toml").is_file() else gr.update(),
                          folder_box, instr_box, api_name=False)  # fmt: skip
        run_evt = run_btn.click(
            live,
            [task_box, folder_box, instr_box, model_box, ckpt_box, url_box, served_box, forks_box, turns_box, rturns_box,
             temp_box, tokens_box, first_box],
            [live_status, live_main, live_attempts, live_json],
            api_name="live", concurrency_limit=config.live_concurrency, concurrency_id="live",
        )  # fmt: skip
        stop_btn.click(None, None, None, cancels=[run_evt], api_name=False)
        demo.unload(end_session)
    return demo


def _model_choices(config: AppConfig) -> dict[str, str]:
    """Model dropdown entries: the configured Hub models first (e.g. the 9B on a ZeroGPU Space), then the
    built-in choices (local checkpoints only where visitors may name local paths)."""
    choices = {m: f"{m[3:]} (transformers)" for m in config.models}
    choices.update({k: v for k, v in MODEL_CHOICES.items() if k != "checkpoint" or config.allow_local_paths})
    return choices


def launch(demo: gr.Blocks, *, host: str | None = None, port: int | None = None, **kwargs) -> gr.Blocks:
    """Launch with the app's theme and CSS (Gradio 6 takes them at launch). Returns the demo."""
    theme = gr.themes.Soft(primary_hue="violet", secondary_hue="indigo", neutral_hue="slate")
    demo.queue(default_concurrency_limit=4)
    demo.launch(server_name=host, server_port=port, theme=theme, css=VIEW_CSS + APP_CSS, **kwargs)
    return demo


def main(argv: list[str] | None = None) -> int:
    """``python space/app.py``: start the demo (prints the URL) and serve until interrupted."""
    p = argparse.ArgumentParser(description="ReTerm Space: replay recorded recoveries, or run the agent live.")
    p.add_argument("--host", default=None, help="address to listen on (default $GRADIO_SERVER_NAME or 127.0.0.1)")
    p.add_argument("--port", type=int, default=None, help="port (default $GRADIO_SERVER_PORT or 7860)")
    p.add_argument("--tasks", action="append", default=None, metavar="DIR", help="a folder of task folders (repeatable)")
    p.add_argument("--source", action="append", default=None, metavar="SPEC", help="a replay source to offer (repeatable)")
    p.add_argument("--runs-dir", default=None, help="where live runs are saved (default ~/.cache/reterm/space-runs)")
    p.add_argument("--max-forks", type=int, default=None, help=f"most recovery attempts per failure (default {MAX_FORKS})")
    p.add_argument("--public", action="store_true", default=None, help="do not let visitors open local paths")
    args = p.parse_args(argv)
    for spec in args.source or []:  # a mistyped local path fails here, not silently in the page
        if not Path(resolve_source(spec)).exists() and (not _HUB_ID.match(spec) or spec.startswith((".", "/", "~"))):
            print(f"space/app.py: --source {spec}: no such file or folder, and not a Hub dataset id (ORG/NAME)",
                  file=sys.stderr)  # fmt: skip
            return 2
    config = default_config(tasks=args.tasks, sources=args.source, runs_dir=args.runs_dir, max_forks=args.max_forks,
                            public=args.public)  # fmt: skip
    host = args.host or os.environ.get("GRADIO_SERVER_NAME") or "127.0.0.1"
    port = args.port or int(os.environ.get("GRADIO_SERVER_PORT") or 7860)
    demo = build_demo(config)
    print(f"live mode: {'on' if config.live_available else 'off'}"
          + (f" ({config.live_message})" if config.live_message else ""), flush=True)  # fmt: skip
    launch(demo, host=host, port=port, prevent_thread_lock=True)
    print(f"ReTerm Space running on {demo.local_url}", flush=True)
    try:
        demo.block_thread()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
