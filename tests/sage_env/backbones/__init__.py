"""Tests of the diffusers video backbones."""
