"""A Hugging Face repository's listing: the commit its main revision points at and every file's
size there, read with ``huggingface_hub`` (a mirror by ``endpoint``, else HF_ENDPOINT; a token from
HF_TOKEN). Its not-found answers (no such repository, revision or file; a gated repository) become
the caller's not-found error, which is not retried; anything else (refused, reset, timed out) the
caller's unreachable error, which is. Each caller names its own two error types."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from scheduler.errors import GpuflowError


def where(endpoint: str | None) -> str:
    """The hub's name in messages."""
    return endpoint or "huggingface.co"


def not_found_errors() -> tuple[type[Exception], ...]:
    from huggingface_hub import errors

    return (errors.RepositoryNotFoundError, errors.EntryNotFoundError, errors.RevisionNotFoundError,
            errors.GatedRepoError)


@contextmanager
def hub_errors(what: str, endpoint: str | None, not_found: type[Exception],
               unreachable: type[Exception]) -> Iterator[None]:
    """Calls to the hub about ``what`` inside: huggingface_hub's errors mapped to the caller's;
    our own errors pass through."""
    try:
        yield
    except not_found_errors() as e:
        raise not_found(f"{what} is not on the hub ({where(endpoint)}): {str(e).splitlines()[0]}") from None
    except GpuflowError:
        raise
    except Exception as e:  # noqa: BLE001  connection refused, DNS, timeouts: retried
        raise unreachable(f"cannot reach the hub ({where(endpoint)}) for {what}: {type(e).__name__}: {e}") from None


def list_repo(repo: str, endpoint: str | None, what: str, not_found: type[Exception],
              unreachable: type[Exception]) -> tuple[str, dict[str, int]]:
    """(commit, {file: size}) of ``repo``'s main revision; ``what`` names it in errors."""
    import huggingface_hub as hf
    from huggingface_hub.hf_api import RepoFile

    with hub_errors(what, endpoint, not_found, unreachable):
        api = hf.HfApi(endpoint=endpoint)
        commit = api.model_info(repo).sha
        sizes = {f.path: f.size for f in api.list_repo_tree(repo, recursive=True, revision=commit)
                 if isinstance(f, RepoFile)}
    return commit, sizes
