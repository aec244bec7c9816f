"""The generative-prior regime: a server-side image generator (an interface;
osfl downloads none) and ``priorkd``, synthesis then ensemble distillation."""

from osfl.methods.generative.method import PriorKD, PriorKDConfig
from osfl.methods.generative.prior import PRIORS, ImagePrior, load_prior, register_prior

__all__ = ["PRIORS", "ImagePrior", "PriorKD", "PriorKDConfig", "load_prior", "register_prior"]
