"""What runs inside a training process: the communicator (negotiation thread and
executor), the negotiation client, the response cache and speculative steps, the
fusion buffer, the data-plane connection to an aggregator (admission, the native
engine, verbs, rack grants), failover and the job's rendezvous, process sets and the
timeline. It never imports the daemon (netreduce/switch); both speak
netreduce/protocol. netreduce.api is its public face."""
