"""Knowledge-graph embeddings: TransE, DistMult, ComplEx and RotatE for link prediction."""
