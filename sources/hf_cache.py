"""The local Hugging Face cache: a repo's snapshot folder, looked up offline (never the network)."""
from __future__ import annotations

from pathlib import Path

from .spec import ModelUnavailable, one_line


def hf_snapshot(repo: str, cache: str | Path | None = None) -> Path:
    """The folder of `org/repo` (or `org/repo@revision`) in the local Hugging Face cache: `cache`, else where
    huggingface_hub looks (HF_HUB_CACHE, HF_HOME/hub, ~/.cache/huggingface/hub). Never the network."""
    try:
        from huggingface_hub import constants, snapshot_download
    except ImportError:
        raise ModelUnavailable("hf: entries need huggingface_hub; fix: pip install huggingface_hub") from None
    repo_id, _, revision = repo.partition("@")
    where = Path(cache or constants.HF_HUB_CACHE)
    try:
        return Path(snapshot_download(repo_id, revision=revision or None, cache_dir=where, local_files_only=True))
    except Exception as e:  # noqa: BLE001 - huggingface_hub's errors: not cached, no such revision, a bad id
        if "validation" in type(e).__name__.lower():
            raise ModelUnavailable(f"hf:{repo} is not a Hugging Face repo id ({one_line(e)}); "
                                   f"give hf:ORG/REPO or hf:ORG/REPO@REVISION") from None
        raise ModelUnavailable(f"hf:{repo} is not in the Hugging Face cache at {where}; attnscope never downloads: "
                               f"fix: `hf download {repo_id}` while online, or point HF_HUB_CACHE / HF_HOME at the "
                               f"cache that holds it") from None
