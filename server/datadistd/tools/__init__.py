"""dev tools"""
