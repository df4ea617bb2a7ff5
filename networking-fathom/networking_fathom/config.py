"""The `[fathom]` section of Neutron's configuration."""
from oslo_config import cfg

OPTS = [
    cfg.ListOpt("url", default=["http://127.0.0.1:8080"],
                help="fathom's REST API: one controller, or the endpoints of its replicas, comma separated "
                     "(a call that fails on one is made on the next)"),
    cfg.StrOpt("token_file", default="/etc/neutron/fathom-token",
               help="file holding a fathom token of role `service` (fathom token create --role service)"),
    cfg.FloatOpt("timeout", default=10.0, help="seconds per request to fathom"),
    cfg.FloatOpt("retry_interval", default=2.0,
                 help="seconds between attempts to replay the journal while fathom is unreachable"),
    cfg.FloatOpt("sync_interval", default=60.0,
                 help="seconds between full syncs (drift repair both ways); 0 = only at start"),
    cfg.FloatOpt("status_wait", default=10.0,
                 help="seconds one long-poll of fathom (GET /v1/ports/<id>?wait=active) waits for a port "
                      "to become active before it asks again"),
    cfg.IntOpt("status_waiters", default=8,
               help="ports awaited at once (one long-poll each); more wait their turn"),
    cfg.StrOpt("upstream_mac", default=None,
               help="MAC of the upstream (provider) router of Neutron's external networks (router:external), "
                    "which fathom's SNAT and floating IPs send to (Neutron does not know it)"),
    cfg.IntOpt("max_attempts", default=5,
               help="a journal entry fathom refuses (4xx) this many times is marked failed; the full "
                    "sync repairs what it left"),
    cfg.FloatOpt("claim_timeout", default=300.0,
                 help="seconds after which a journal entry a Neutron worker claimed and never finished "
                      "(the worker died) is taken over by another; far above the time one entry's requests "
                      "can take (`timeout` each)"),
    cfg.FloatOpt("completed_retention", default=86400.0,
                 help="seconds completed journal entries are kept (the full sync also reads which "
                      "projects they name)"),
]

cfg.CONF.register_opts(OPTS, "fathom")


def conf():
    return cfg.CONF.fathom
