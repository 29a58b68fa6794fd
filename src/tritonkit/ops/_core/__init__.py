"""What the kernel families share: the launch path (``launch``), registration with PyTorch
(``registry``), validation (``validate``), tensor layouts (``layout``), device properties
(``device``), row-kernel machinery (``rows``), partial and column sums (``reduce``) and device
math (``math``). A family imports from here, never another family's private names."""
