"""A Flower app with a bayesadmm method as its strategy."""
