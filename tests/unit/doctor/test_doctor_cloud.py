"""Where the machine runs, asked of a loopback metadata server that answers as GCE's and AWS IMDSv2's do."""

from __future__ import annotations

import time

from tests.helpers.metadata import MetadataServer
from tests.helpers.servers import free_port
from voxrelay.doctor.cloud import GCE_METADATA, Machine, aws_region, gce_zone, machine_location, metadata_bases


def test_gce_zone_gives_region_and_zone():
    with MetadataServer(gce_zone="us-central1-a") as md:
        assert gce_zone(md.url) == Machine("gcp", "us-central1", "us-central1-a")
        assert machine_location(md.url) == Machine("gcp", "us-central1", "us-central1-a")


def test_aws_region_through_an_imdsv2_token():
    with MetadataServer(aws_region="eu-west-1") as md:
        assert aws_region(md.url) == Machine("aws", "eu-west-1")
        assert machine_location(md.url) == Machine("aws", "eu-west-1")
        assert md.requests[:2] == [("PUT", "/api/token"), ("GET", "/meta-data/placement/region")]


def test_no_metadata_server_answers_none_within_the_timeout():
    with MetadataServer() as md:  # a server that knows neither cloud: 404s
        t0 = time.monotonic()
        assert machine_location(md.url) is None
        assert time.monotonic() - t0 < 2.0
    t0 = time.monotonic()
    assert machine_location(f"http://127.0.0.1:{free_port()}") is None  # nothing listening
    assert time.monotonic() - t0 < 2.0


def test_a_zone_without_the_google_header_is_not_gce():
    with MetadataServer(gce_zone="us-central1-a", gce_header=False) as md:
        assert machine_location(md.url) is None


def test_metadata_bases_from_the_sdks_variables(monkeypatch):
    for var in ("GCE_METADATA_HOST", "AWS_EC2_METADATA_SERVICE_ENDPOINT", "AWS_EC2_METADATA_DISABLED"):
        monkeypatch.delenv(var, raising=False)
    assert metadata_bases()["gcp"] == GCE_METADATA
    assert metadata_bases("http://127.0.0.1:9/") == {"gcp": "http://127.0.0.1:9", "aws": "http://127.0.0.1:9"}
    monkeypatch.setenv("GCE_METADATA_HOST", "127.0.0.1:8080")
    monkeypatch.setenv("AWS_EC2_METADATA_SERVICE_ENDPOINT", "http://[fd00:ec2::254]")
    assert metadata_bases() == {"gcp": "http://127.0.0.1:8080/computeMetadata/v1",
                                "aws": "http://[fd00:ec2::254]/latest"}
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    assert "aws" not in metadata_bases()
