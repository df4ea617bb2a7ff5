"""fathom: an SDN fabric for OpenStack-style clouds and NFV that operators can see into."""
__version__ = "0.1.0"
