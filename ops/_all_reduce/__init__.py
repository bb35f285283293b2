"""All-reduce algorithms, one per module, sharing the contract of `base.AllReduce`."""
