"""The provenance stamp of a notebook's execution: what its outputs depend on (the notebook, its parameters, the
package, data/), and the machine they were made on, kept beside the figure digests to say why a figure changed."""
from pathlib import Path

from replication import __version__
from replication.core import config, files
from replication.core.config import NOTEBOOKS, cpu_bf16


def package_digest() -> str:
    """Hash of the package's source, so a code change re-executes the notebooks."""
    srcs = sorted((config.ROOT / "replication").rglob("*.py"))
    return files.digest(__version__, *[p.read_bytes() for p in srcs])


def data_digest() -> str:
    """Hash of data/ (the papers' numbers and the generated datasets the notebooks read)."""
    data = config.ROOT / "data"
    srcs = sorted(p for p in data.rglob("*") if p.is_file()) if data.is_dir() else []
    return files.digest(*[x for p in srcs for x in (str(p.relative_to(data)), p.read_bytes())])


def stamp(stem: str, params: dict, folder: Path = NOTEBOOKS) -> str:
    """Identity of one execution: the notebook, its parameters, the package and data/ (the papers' numbers the
    verdicts read)."""
    return files.digest((Path(folder) / f"{stem}.ipynb").read_bytes(), params, package_digest(), data_digest())


def machine() -> str:
    """What CPU numerics depend on besides the code: the architecture and the thread count the kernels get."""
    import os
    import platform

    return f"{platform.machine()}, threads {os.environ.get('OMP_NUM_THREADS') or f'default ({os.cpu_count()} cpus)'}"


def stamp_parts(stem: str, params: dict, folder: Path = NOTEBOOKS, accelerator: str = "cpu") -> dict:
    """The stamp's parts one by one, and data/, the machine, the CPU's bf16 instruction sets and the device the
    models compute on (`accelerator`, as the runner names it): kept beside the figure digests to say why a figure
    changed."""
    return {"notebook": files.digest((Path(folder) / f"{stem}.ipynb").read_bytes()), "params": files.digest(params),
            "package": package_digest(), "data": data_digest(), "machine": machine(), "cpu_bf16": cpu_bf16(),
            "accelerator": accelerator}
