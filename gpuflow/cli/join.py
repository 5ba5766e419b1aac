"""How a host joins the cluster, from the command line: ``gpuflow hosts join-token`` (the token,
read from the store itself: never through Temporal, whose histories anyone with access to it can
read), and the credential ``gpuflow agent`` opens before it connects (worker_agent/credential.py)."""

from __future__ import annotations

import sys

from scheduler.errors import InvalidInput


def print_join_token(s) -> int:
    """Print the cluster's join token (stdout: the token alone), read from the store that the
    settings name (--data-dir's SQLite file, or --database-url)."""
    from sqlalchemy.exc import SQLAlchemyError

    from gpuflow.serving_view import open_store
    from store import host_credentials

    url = s.store_url()
    engine = open_store(s, False)
    if engine is None:
        raise InvalidInput(f"no store at {url}: run this where the control plane's store is, naming it with "
                           "--data-dir DIR or --database-url URL (gpuflow dev keeps it in ~/.local/share/gpuflow/dev)")
    try:
        token = host_credentials.join_token(engine)
    except SQLAlchemyError as e:
        raise InvalidInput(f"the store at {engine.url.render_as_string(hide_password=True)} holds no cluster "
                           f"credential that can be read ({str(e).splitlines()[0][:200]}): start a control plane on "
                           "it first ('gpuflow server' or 'gpuflow dev')") from None
    finally:
        engine.dispose()
    if token is None:
        raise InvalidInput("the store has no cluster credential yet: start a control plane on it first "
                           "('gpuflow server' or 'gpuflow dev')")
    print("the join token lets a machine join this cluster as a host: keep it secret (give it to an agent in "
          "GPUFLOW_AGENT__JOIN_TOKEN or --join-token-file FILE)", file=sys.stderr, flush=True)
    print(token, flush=True)
    return 0


def agent_credential(a, s, name: str):
    """The host's credential for ``gpuflow agent``, opened (its folder locked) before the agent
    connects: the token from --join-token, --join-token-file or the settings, needed at the first start only."""
    from worker_agent.agent import agent_folder
    from worker_agent.credential import open_credential, read_token

    given = a.join_token or (s.agent.join_token.get_secret_value() if s.agent.join_token else None)
    token = read_token(given, a.join_token_file or s.agent.join_token_file)
    return open_credential(agent_folder(s.data_dir, name), name, token)
