"""How a GPU source or an alert sink declares a secret it reads (issue 26 item 5): redaction is derived
from these declarations (:func:`gpuheal.credentials.secrets_for`), so a second sink's webhook URL or a
token in a variable not named like a secret is removed from everything gpuheal writes, as Zulip's key
is. Pure: a record; the lookup (environment, then ``.env``: Lesson L4) is :mod:`gpuheal.credentials`'.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Secret:
    """One secret of a source's or a sink's config section.

    - ``field`` names the variable holding it (``zulip.api_key_env``: the environment, then ``.env``);
      ``env`` is the variable when the section has no such field or leaves it empty (its default, or
      the fixed variable of a sink without a section);
    - ``in_config``: ``field`` holds the secret itself (``litellm.api_key``)."""

    field: str = ""
    env: str = ""
    in_config: bool = False
