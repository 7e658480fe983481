"""The built-in reward component kinds, one module each, each defining one `ComponentKind` (no registration
happens here: `rewards/components.py` imports every kind by name and registers it)."""
