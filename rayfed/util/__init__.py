"""What every layer of rayfed may use: errors, value checks, registries, documented config fields,
seeds, atomic files, progress bars and lazy exports. Nothing here imports another rayfed package."""
