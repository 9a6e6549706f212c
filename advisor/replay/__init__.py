"""Trace replay: the FGD paper's fill-until-full protocol, our migration variant, CSV + plot."""
