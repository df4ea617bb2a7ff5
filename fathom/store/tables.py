"""The whole schema on one metadata: each model module registers its tables on
fathom.store.base.Base when imported, and this module imports them all (for the migrations and
the check that migrations and models agree)."""
from fathom.cluster import models as cluster_models  # noqa: F401 - the cluster's replicas and leases
from fathom.store import agent_models, auth_models, external_models, fabric_models, models, pptmon_models, sfc_models  # noqa: F401,E501
from fathom.store import request_models  # noqa: F401 - writes' request ids
from fathom.store import flow_records_models  # noqa: F401 - flow records' sampling rates
from fathom.store.base import Base

metadata = Base.metadata
