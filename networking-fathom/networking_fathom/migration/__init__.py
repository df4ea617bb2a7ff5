"""networking-fathom's branch of Neutron's database migrations (`neutron-db-manage --subproject
networking-fathom upgrade head`, or `upgrade heads` for every installed project): the journal table."""
