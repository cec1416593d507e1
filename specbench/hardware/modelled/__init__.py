"""Cost models of hardware from datasheet figures: nothing here runs a model or times anything."""
