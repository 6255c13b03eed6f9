"""What finished runs show: figures drawn from run directories (``rayfed plot``)."""
