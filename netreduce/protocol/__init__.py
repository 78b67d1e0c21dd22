"""What a rank and an aggregator both speak, and so both import: aggregator
addresses, the control port's JSON-lines client, the job-secret challenge, a
tensor's negotiation signature and the fusion cut every side makes alike."""
