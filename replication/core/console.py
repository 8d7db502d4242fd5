"""What the runner shows while a notebook executes: one progress line per notebook (cells done out of the total,
the section being run, the notebook's own tqdm bar), and none of the kernel's or papermill's log noise."""
import html
import logging
import re
import sys
import threading

from tqdm import tqdm

# The kernel logs "Kernel is running over TCP without encryption" (and its start-up chatter) at WARNING to the
# terminal; its errors still show.
KERNEL_ARGS = ["--IPKernelApp.log_level=ERROR"]
# tqdm's notebook bar is two text widgets around a progress widget: "desc:  40%" and "4/10 [00:01<00:02, 2.00it/s]".
_RIGHT = re.compile(r"^\s*\d+(\.\d+)?[kMG]?(/\d+(\.\d+)?[kMG]?)?\s*\[")
_LEFT = re.compile(r"\d+%$")


def quiet() -> None:
    """Show only papermill's and nbclient's errors: papermill logs a warning for each parameters-cell line its
    translator cannot parse ("Unable to parse line 27"), harmless since the runner passes the parameters itself."""
    for name in ("papermill", "nbclient", "traitlets"):
        logging.getLogger(name).setLevel(logging.ERROR)


# Library warnings known to be harmless, each with why; quiet_warnings() hides these and nothing else.
HARMLESS_WARNINGS = (
    # peft 0.21.2 reads transformers' deprecated `is_gradient_checkpointing` whenever it wraps a model in LoRA
    # adapters; the TRL path (transformers 5.23's Trainer) also calls the deprecated `gradient_checkpointing`
    # argument and the `gradient_checkpointing_enable` / `_disable` methods. All are FutureWarnings about transformers
    # v6 that no code of this package can act on (they come from inside peft, TRL and transformers).
    "`is_gradient_checkpointing` is deprecated",
    "`gradient_checkpointing` is deprecated",
    "`gradient_checkpointing_enable` is deprecated",
    "`gradient_checkpointing_disable` is deprecated",
)


def quiet_warnings() -> None:
    """Hide the library warnings known to be harmless (HARMLESS_WARNINGS), here and nowhere else: workbook.start
    calls it in every notebook, the `train` command at its start. Every other warning still shows."""
    import warnings

    for message in HARMLESS_WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=FutureWarning)


def heading(cell) -> str:
    """The first Markdown heading of a cell, without its #s ('' for none)."""
    if cell.get("cell_type") != "markdown":
        return ""
    lines = [line.lstrip("#").strip() for line in cell.get("source", "").splitlines() if line.startswith("#")]
    return lines[0] if lines else ""


class Progress:
    """One bar for one notebook: cells done out of `total`, the current section (the last Markdown heading run) and
    the text of the notebook's own tqdm bar, read from its widget messages. On a terminal the bar is redrawn every
    second, so the clock moves during a long cell; in a log (not a terminal) each new section gets a line."""

    def __init__(self, stem: str, total: int, file=None):
        self.stem, self.file = stem, file or sys.stderr
        self.tty = self.file.isatty()
        self.section, self.inner = "", {}
        self.bar = tqdm(total=total, unit="cell", desc=f"[{stem}]", file=self.file, dynamic_ncols=True,
                        mininterval=0.5 if self.tty else 60, bar_format="{desc} {n}/{total} cells {elapsed}{postfix}")
        self._done = threading.Event()
        if self.tty:
            threading.Thread(target=self._tick, daemon=True).start()

    def _tick(self) -> None:
        while not self._done.wait(1.0):
            self.bar.refresh()

    def _show(self) -> None:
        inner = " ".join(v for v in (self.inner.get("left"), self.inner.get("right")) if v)
        self.bar.set_postfix_str(" | ".join(s for s in (self.section[:60], inner) if s), refresh=False)
        if self.tty:
            self.bar.refresh()

    def cell_start(self, cell, cell_index: int, **_) -> None:
        """nbclient's on_cell_start hook: the cells before this one are done; a Markdown heading opens a section."""
        title = heading(cell)
        self.section = title or self.section
        self.inner = {}
        self.bar.n = min(cell_index, self.bar.total)
        self._show()
        if title and not self.tty:
            tqdm.write(str(self.bar), file=self.file)

    def widget_text(self, state: dict) -> None:
        """A text widget's new value: kept when it is one side of a tqdm bar."""
        value = " ".join(html.unescape(re.sub(r"<[^>]+>", " ", str(state.get("value", "")))).split())
        if _RIGHT.match(value):
            self.inner["right"] = value
        elif _LEFT.search(value):
            self.inner["left"] = value
        else:
            return
        self._show()

    def engine(self) -> str:
        """Register a papermill engine whose kernel client shows the notebook's text widgets to this bar, and return
        its name (papermill's nbclient engine otherwise)."""
        from papermill.clientwrap import PapermillNotebookClient
        from papermill.engines import NBClientEngine, papermill_engines
        from papermill.utils import merge_kwargs, remove_args

        progress = self

        class Text:
            """Stands in for a front end's copy of one text widget: passes its value to the progress bar."""

            def __init__(self, comm_id, state, kernel_client, executor):
                progress.widget_text(state)

            def handle_msg(self, msg):
                data = msg["content"].get("data", {})
                if data.get("method") == "update":
                    progress.widget_text(data.get("state", {}))

        class Client(PapermillNotebookClient):
            def __init__(self, *args, **kw):
                super().__init__(*args, **kw)
                self.widget_registry["@jupyter-widgets/controls"] = {"HTMLModel": Text}

        class Engine(NBClientEngine):
            @classmethod
            def execute_managed_notebook(cls, nb_man, kernel_name, log_output=False, stdout_file=None,
                                         stderr_file=None, start_timeout=60, execution_timeout=None, **kwargs):
                """NBClientEngine's, with the client above."""
                kwargs = remove_args(["input_path"], **kwargs)
                final = merge_kwargs(remove_args(["timeout", "startup_timeout"], **kwargs),
                                     timeout=execution_timeout or kwargs.get("timeout"), startup_timeout=start_timeout,
                                     kernel_name=kernel_name, log=logging.getLogger("papermill"),
                                     log_output=log_output, stdout_file=stdout_file, stderr_file=stderr_file)
                return Client(nb_man, **final).execute()

        name = f"replication-{self.stem}"   # one per notebook: notebooks run side by side (runner --jobs) keep their bars
        papermill_engines.register(name, Engine)
        return name

    def close(self, done: bool) -> None:
        """Stop the clock; a finished notebook shows all its cells done."""
        self._done.set()
        if done:
            self.bar.n = self.bar.total
            self.section, self.inner = "", {}
            self._show()
        self.bar.close()
