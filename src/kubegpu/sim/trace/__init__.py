"""Replaying published cluster traces through the placement core: Alibaba's GPU-sharing trace and the FGD paper's
protocol (`reader`, `replay`), and the `kubegpu trace` command (`cli`)."""
