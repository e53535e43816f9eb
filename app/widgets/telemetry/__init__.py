"""The live speed panel and the pure meters behind it."""
