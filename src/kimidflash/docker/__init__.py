"""The docker runtime: engine discovery, the CPU base image, the image build,
the container spec and the container lifecycle. Imports the docker SDK lazily:
the rest of the recipe works without it."""
