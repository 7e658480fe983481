"""The evaluate stage: held-out evaluation of policies (`run`), its statistics (`metrics`) and the HTML
report over the store (`report`)."""
