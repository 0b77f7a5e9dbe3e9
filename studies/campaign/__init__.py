"""Training evidence (study 8; the runs need a GPU): the paired-seed campaign (its arms, data stream, runs, batch
planning, device ledger and paired statistics) and :mod:`studies.campaign.train_lm`, the earlier small-LM runs."""
