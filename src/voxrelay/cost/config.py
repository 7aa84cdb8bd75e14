"""The ``cost`` section of a run config: prices (USD) and the optional budget.

Default prices are Google Cloud Storage's list prices for Standard storage in a North American region
(us-central1, us-east1), as of 2025:

* storage $0.020 per GiB-month and operations $0.005 per 1,000 class A / $0.0004 per 1,000 class B
  (= $0.05 / $0.004 per 10,000): https://cloud.google.com/storage/pricing (the regional table) and its
  worked example, https://cloud.google.com/storage/pricing-examples;
* data moved between regions of one continent and the inter-region replication of a multi-region bucket
  (the "Network Data Transfer GCP Replication within Northern America" of seed 000's bill): $0.02 per GiB
  in North America (more elsewhere; $0.12 to the internet): the same page's network and replication tables;
* deleted objects are billed for the bucket's soft-delete retention, 7 days by default since 2024.

S3 Standard (us-east-1) is $0.023 per GB-month, $0.05 per 10,000 PUT/COPY/POST/LIST and $0.004 per 10,000
GET; set the keys to your provider's and region's prices. Torch-free (``config show`` imports it).
"""

from __future__ import annotations

from pydantic import Field, model_validator

from voxrelay.config.fields import Section


class CostConfig(Section):
    gpu_hour: float | None = Field(
        None, ge=0, description="USD per GPU-hour (a CPU run: per process-hour), e.g. 1.3 for a Colab A100 at "
        "13 compute units an hour; GPU-hours = session time (from each process's start) x processes. None: the "
        "hours are reported, not priced (and cost.budget cannot be used)",
    )
    storage_gb_month: float = Field(
        0.020, ge=0, description="USD per GiB-month stored (checkpoints kept; deleted ones for soft_delete_days): "
        "GCS Standard in a region such as us-central1 (S3 Standard: 0.023; a GCS multi-region: 0.026)",
    )
    class_a_per_10k: float = Field(
        0.05, ge=0, description="USD per 10,000 class A operations (writes, listings): GCS Standard in a region "
        "(S3: 0.05 per 10,000 PUT/LIST)",
    )
    class_b_per_10k: float = Field(
        0.004, ge=0, description="USD per 10,000 class B operations (reads, metadata): GCS Standard (S3: 0.004 per "
        "10,000 GET)",
    )
    cross_region: bool = Field(
        False, description="The bucket is in another region than the machine (e.g. a Colab runtime in Asia, a "
        "bucket in us-central1): every byte read from or written to it is priced at egress_gb",
    )
    egress_gb: float = Field(
        0.02, ge=0, description="cross_region: USD per GiB moved between the machine and the bucket (GCS within "
        "North America: 0.02; between continents 0.05-0.15; to the internet, a machine outside the cloud: 0.12)",
    )
    multi_region: bool = Field(
        False, description="The bucket is multi-region or dual-region: every byte written is replicated to other "
        "regions, priced at replication_gb (a regional bucket in the GPU's region has no such charge)",
    )
    replication_gb: float = Field(0.02, ge=0, description="multi_region: USD per GiB written, for its replication "
                                  "(GCS in North America: 0.02)")
    soft_delete_days: float = Field(
        7.0, ge=0, description="Days a deleted or overwritten object is still billed (the bucket's soft-delete "
        "retention: 7 by default on GCS; 0 once it is off, e.g. `gcloud storage buckets update gs://B "
        "--clear-soft-delete`, or on S3 without versioning)",
    )
    keep_months: float = Field(
        1.0, ge=0, description="Months the run's final checkpoints stay in the bucket after training, priced in "
        "the estimate to finish",
    )
    budget: float | None = Field(
        None, gt=0, description="USD: training stops cleanly (checkpoint committed, exit 77) before the estimate of "
        "what it has spent (GPU-hours, operations, egress, replication) would pass it; a later session refuses to "
        "start (exit 2) until it is raised. None: no budget",
    )

    @model_validator(mode="after")
    def _budget_needs_gpu_price(self) -> CostConfig:
        if self.budget is not None and self.gpu_hour is None:
            raise ValueError(f"cost.budget={self.budget} needs cost.gpu_hour (the GPU is most of the bill): set "
                             "cost.gpu_hour to the USD per GPU-hour you pay (0 for a free GPU)")
        return self
