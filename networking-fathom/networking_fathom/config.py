"""The `[fathom]` section of Neutron's configuration."""
from oslo_config import cfg

OPTS = [
    cfg.StrOpt("url", default="http://127.0.0.1:8080", help="fathom's REST API (the controller)"),
    cfg.StrOpt("token_file", default="/etc/neutron/fathom-token",
               help="file holding a fathom token of role `service` (fathom token create --role service)"),
    cfg.FloatOpt("timeout", default=10.0, help="seconds per request to fathom"),
    cfg.FloatOpt("retry_interval", default=2.0,
                 help="seconds between attempts to replay the journal while fathom is unreachable"),
    cfg.FloatOpt("sync_interval", default=60.0,
                 help="seconds between full syncs (drift repair both ways); 0 = only at start"),
    cfg.FloatOpt("status_interval", default=0.5,
                 help="seconds between checks of the ports waiting to become active in fathom"),
    cfg.IntOpt("max_attempts", default=5,
               help="a journal entry fathom refuses (4xx) this many times is marked failed; the full "
                    "sync repairs what it left"),
    cfg.FloatOpt("completed_retention", default=86400.0,
                 help="seconds completed journal entries are kept (the full sync also reads which "
                      "projects they name)"),
]

cfg.CONF.register_opts(OPTS, "fathom")


def conf():
    return cfg.CONF.fathom
