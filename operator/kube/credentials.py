"""Where the operator's credentials come from, once, for kopf and for its own client.

The `kubernetes` package's loaders read them: the pod's service account in a cluster,
or a kubeconfig (`$KUBECONFIG` or `--kubeconfig`, any of its contexts) with whatever
authentication it names: a token, client certificates, or an exec plugin (cloud
providers' `aws eks get-token`, `gke-gcloud-auth-plugin`). The result is kopf's
`ConnectionInfo`, which kopf logs in with and `Kube.connect` builds the operator's own
HTTP client from, so the two always speak to the same server as the same user. The
operator keeps its own small client (`client.py`) rather than the `kubernetes` package's
generated one: it needs six verbs on a handful of kinds, async, and the generated
client is synchronous (kopf's own API calls are aiohttp too).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import kopf


class CredentialsError(Exception):
    """Neither a service account nor a usable kubeconfig: the sentence says which."""


def connection(
    *, server: str | None = None, kubeconfig: Path | None = None, context: str | None = None
) -> kopf.ConnectionInfo:
    """`server`: that URL, unauthenticated and unverified (a local emulator or a
    `kubectl proxy`). Else a kubeconfig when one or a context is named, else the pod's
    service account, else the default kubeconfig."""
    if server is not None:
        return kopf.ConnectionInfo(server=server, insecure=True)
    import kubernetes  # noqa: PLC0415  # its loaders take a while to import

    config = kubernetes.client.Configuration()
    try:
        if kubeconfig is None and context is None:
            try:
                kubernetes.config.load_incluster_config(client_configuration=config)  # type: ignore[no-untyped-call]
            except kubernetes.config.ConfigException:
                kubernetes.config.load_kube_config(client_configuration=config)  # type: ignore[no-untyped-call]
        else:
            kubernetes.config.load_kube_config(  # type: ignore[no-untyped-call]
                config_file=str(kubeconfig) if kubeconfig else None,
                context=context,
                client_configuration=config,
            )
    except (kubernetes.config.ConfigException, OSError) as e:
        raise CredentialsError(f"no Kubernetes credentials: {e}") from None
    # A token (also an exec plugin's or a token file's) is kept as an API key.
    header = config.get_api_key_with_prefix("BearerToken") or config.get_api_key_with_prefix(
        "authorization"
    )
    parts: Sequence[str] = header.split(" ", 1) if header else []
    scheme, token = (
        (None, None) if not parts else (None, parts[0]) if len(parts) == 1 else (parts[0], parts[1])
    )
    return kopf.ConnectionInfo(
        server=config.host,
        ca_path=config.ssl_ca_cert,
        insecure=not config.verify_ssl,
        username=config.username or None,
        password=config.password or None,
        scheme=scheme,
        token=token,
        certificate_path=config.cert_file,
        private_key_path=config.key_file,
    )
