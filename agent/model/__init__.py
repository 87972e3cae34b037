"""Pure data model: parsing MachineConfigs, Ignition, image references and bootc status."""
