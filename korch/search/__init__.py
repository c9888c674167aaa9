"""The candidate space: partitions of the primitive graph, what one kernel may hold (legality), the candidates
enumerated in each partition, and a candidate cut out as a kernel graph."""
