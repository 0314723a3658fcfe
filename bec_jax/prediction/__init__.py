"""The prediction front: a sweep of an algorithm on finite MDPs, its spec, sampler, kernel, results and figures."""
