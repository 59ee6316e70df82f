"""Training on tailjit's own gradients: when a traced training graph may take them, and compiling it so
(``expr_grad``)."""
