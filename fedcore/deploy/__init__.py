"""Deployment: a peer process (``fedcore node``), ``fedcore launch`` of many on one machine,
and the writers of docker-compose, Swarm stack and Kubernetes files."""
