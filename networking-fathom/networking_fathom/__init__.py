"""Neutron drivers for fathom.

- `networking_fathom.ml2.FathomMechanismDriver` (ML2 `mechanism_drivers = fathom`): networks,
  subnets, ports and their binding.
- `networking_fathom.l3`: L3 service providers, one per fathom router mode, offered as L3 flavors.
- `networking_fathom.journal`: every write is recorded in Neutron's database in the transaction
  that makes it (table `fathom_journal`) and replayed to fathom in order by one thread; a full sync
  at start and every `[fathom] sync_interval` seconds repairs drift both ways.
- `networking_fathom.resources`: one module per kind of object, saying how a Neutron object maps
  onto a fathom one (adding a kind is adding a module there).
"""
