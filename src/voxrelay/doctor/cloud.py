"""Where this machine runs, from the cloud's metadata server (no ``curl ipinfo.io``): a GCE VM's (a Colab
runtime is one) zone, an EC2 instance's region (IMDSv2).

Base URLs: ``checkpoint.metadata_url`` when set (both kinds are asked there: a test server, a proxy), else
``$GCE_METADATA_HOST`` (google-auth's variable) / the link-local address for GCE and
``$AWS_EC2_METADATA_SERVICE_ENDPOINT`` (botocore's) / :data:`~voxrelay.checkpoint.preemption.AWS_METADATA` for
AWS (``AWS_EC2_METADATA_DISABLED=true`` skips it). Both are asked at once with a short timeout, so a machine
outside these clouds answers within about a second.
"""

from __future__ import annotations

import http.client
import os
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass

from voxrelay.checkpoint.preemption import AWS_METADATA

# the GCE metadata server by address: no DNS lookup of metadata.google.internal, which can hang off GCE
GCE_METADATA = "http://169.254.169.254/computeMetadata/v1"
TIMEOUT_S = 1.0


@dataclass(frozen=True)
class Machine:
    """Where this machine runs: ``cloud`` ("gcp" or "aws"), ``region`` (us-central1, us-east-1), ``zone``."""

    cloud: str
    region: str
    zone: str | None = None


def metadata_bases(override: str | None = None) -> dict[str, str]:
    """cloud -> the metadata server's base URL to ask (see the module docstring)."""
    if override:
        return {"gcp": override.rstrip("/"), "aws": override.rstrip("/")}
    bases = {"gcp": f"http://{os.environ['GCE_METADATA_HOST']}/computeMetadata/v1"
             if os.environ.get("GCE_METADATA_HOST") else GCE_METADATA}
    if os.environ.get("AWS_EC2_METADATA_DISABLED", "").lower() != "true":
        endpoint = os.environ.get("AWS_EC2_METADATA_SERVICE_ENDPOINT")
        bases["aws"] = f"{endpoint.rstrip('/')}/latest" if endpoint else AWS_METADATA
    return bases


def gce_zone(base: str, timeout: float = TIMEOUT_S) -> Machine | None:
    """The GCE metadata server's ``instance/zone`` (``projects/123/zones/us-central1-a``); None when what
    answered is not one (no ``Metadata-Flavor: Google`` header)."""
    req = urllib.request.Request(f"{base}/instance/zone", headers={"Metadata-Flavor": "Google"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        if resp.headers.get("Metadata-Flavor") != "Google":
            return None
        zone = resp.read().decode().strip().rsplit("/", 1)[-1]
    return Machine("gcp", zone.rsplit("-", 1)[0], zone) if zone.count("-") >= 2 else None


def aws_region(base: str, timeout: float = TIMEOUT_S) -> Machine | None:
    """EC2's ``placement/region`` with an IMDSv2 token (without one where the instance only speaks IMDSv1)."""
    headers = {}
    try:
        token_req = urllib.request.Request(f"{base}/api/token", method="PUT",
                                           headers={"X-aws-ec2-metadata-token-ttl-seconds": "60"})
        with urllib.request.urlopen(token_req, timeout=timeout) as resp:
            headers["X-aws-ec2-metadata-token"] = resp.read().decode().strip()
    except urllib.error.HTTPError as err:
        if err.code not in (403, 405):  # IMDSv2 off (or a server that is not IMDS: the GET below decides)
            return None
    req = urllib.request.Request(f"{base}/meta-data/placement/region", headers=headers)
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        region = resp.read().decode().strip()
    return Machine("aws", region) if region.count("-") >= 2 and " " not in region else None


def _ask(probe, base: str, timeout: float) -> Machine | None:
    try:
        return probe(base, timeout)
    except (OSError, ValueError, http.client.HTTPException):  # refused, timed out, 404, not HTTP: not this cloud
        return None


def machine_location(override: str | None = None, timeout: float = TIMEOUT_S) -> Machine | None:
    """Where this machine runs, or None when no metadata server answered within ``timeout`` seconds."""
    probes = {"gcp": gce_zone, "aws": aws_region}
    pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="voxrelay-metadata")
    futures = [pool.submit(_ask, probes[cloud], base, timeout) for cloud, base in metadata_bases(override).items()]
    done, _ = wait(futures, timeout=timeout + 0.5)
    pool.shutdown(wait=False, cancel_futures=True)  # a probe still connecting ends by its own timeout
    found = [f.result() for f in futures if f in done and f.result() is not None]
    return found[0] if found else None
