"""The `sample` action every app puts at a flow-records observation point (fathom.model.flow_records)."""
from __future__ import annotations

from fathom.model import flow_records as fr
from fathom.openflow.spec import Sample


def sample(rate: int, kind: int, object_id: int) -> tuple:
    """The sample action of a flow-records observation point at one in `rate` (none when off)."""
    if not rate:
        return ()
    return (Sample(fr.probability(rate), fr.COLLECTOR_SET, fr.OBS_DOMAIN, fr.point_id(kind, object_id)),)
